"""Fitting the draft tree to the device: what a step costs (cost_model), how often each node is
right (acceptance_stats), and the tree that maximizes tokens per second (tree_design)."""
