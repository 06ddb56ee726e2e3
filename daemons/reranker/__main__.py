from daemons.reranker.broker import main

main()
