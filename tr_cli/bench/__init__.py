"""`tr bench`: Token Recycling against transformers greedy and prompt lookup, side by side."""
