from qualify.cli import main

main()
