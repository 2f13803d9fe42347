"""``python -m core.cli``: the ``core`` command, as the resume command a sweep prints may start it."""

import sys

from core.cli import main

sys.exit(main())
