"""An MCP server written for the tests with the `mcp` package: a glossary with one tool, `define`."""

from mcp.server.mcpserver import MCPServer

GLOSSARY = {"lumen": "a unit of luminous flux", "parsec": "a unit of distance", "joule": "a unit of energy"}
server = MCPServer("glossary")


@server.tool()
def define(word: str) -> str:
    """The definition of a word, or an error for a word the glossary does not hold."""
    if word.lower() not in GLOSSARY:
        raise ValueError(f"no entry for {word!r}")
    return GLOSSARY[word.lower()]


def contains(task: dict, answer: str) -> float:
    """The tests' checker: 1 when the answer holds the task's answer."""
    return float(task["answer"] in answer.lower())


if __name__ == "__main__":
    server.run("stdio")
