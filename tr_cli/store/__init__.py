"""State that outlives the process, in the data dir: where it lives, atomic and locked writes,
matrix files and the recycled stores beside them (read, written, moved as a pair), the hot matrix
a command decodes with, its acceptance statistics, and the t(N) calibration cache. Errors name
no command-line flags: what would fix them is a Remedy (remedies.py) the caller words."""
