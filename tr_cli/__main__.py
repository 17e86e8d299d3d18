from tr_cli.cli import main

main()
