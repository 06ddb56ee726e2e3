from daemons.watcher.service import main

main()
