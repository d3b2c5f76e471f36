"""The MCP environment's default server: a calculator with two tools, served over stdio.

`python -m ragen2.envs.external.mcp_calculator` runs it; `ragen2.envs.make("mcp:calculator")` starts it
with the default arithmetic tasks, so the environment runs offline with nothing to configure.
"""

from mcp.server.mcpserver import MCPServer

server = MCPServer("calculator")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


if __name__ == "__main__":
    server.run("stdio")
