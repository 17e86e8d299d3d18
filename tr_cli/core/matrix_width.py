"""How many candidates a matrix row keeps unless asked otherwise (the paper's k = 8), in a module
of its own so that the command line shows it without importing torch."""

DEFAULT_K = 8
