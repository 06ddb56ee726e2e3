from daemons.mcp_server.server import main

main()
