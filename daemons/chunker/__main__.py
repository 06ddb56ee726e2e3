from daemons.chunker.service import main

main()
