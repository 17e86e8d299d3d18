"""Chat without the terminal: the session (turns from the KV cache), settings, slash commands,
multi-line input and conversation files. tr_cli/cli/chat*.py draws and reads."""
