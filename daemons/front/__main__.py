from daemons.front.service import main

main()
