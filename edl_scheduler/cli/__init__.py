"""edlctl, the command-line client."""
