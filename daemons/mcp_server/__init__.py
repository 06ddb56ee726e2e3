"""MCP server (stdio) exposing the workspace index to MCP clients: ``python -m daemons.mcp_server``."""
