"""What a run leaves behind: the result document, the machine it ran on, the SQLite store and its
summaries, and output files written whole or not at all."""
