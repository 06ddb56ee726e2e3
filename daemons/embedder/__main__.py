from daemons.embedder.service import main

main()
