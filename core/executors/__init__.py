"""Framework executors shared by every vendor: a vendor configures them, it does not copy them."""
