"""ragen2's filtering and collapse diagnostics inside other trainers (optional extras).

`ragen2.integrations.trl` needs `pip install 'ragen2[trl]'`; it is not imported here, so
`import ragen2` never pulls in a trainer library.
"""
