from daemons.searcher.service import main

main()
