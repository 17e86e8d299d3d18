"""State that outlives the process: where it lives, atomic and locked writes, matrix files, the
hot matrix a command decodes with, its acceptance statistics, and the t(N) calibration cache."""
