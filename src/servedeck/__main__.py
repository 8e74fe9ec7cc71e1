from servedeck.cli import main

main()
