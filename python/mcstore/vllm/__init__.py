"""mcstore's vLLM KV connector: kv_connector="MCStoreConnector",
kv_connector_module_path="mcstore.vllm". See docs/vllm.md.

MCStoreConnector is imported on first use, so `mcstore.vllm.blocks` works without vLLM."""

from typing import Any

__all__ = ["MCStoreConnector", "MCStoreConnectorStats"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from mcstore.vllm import connector
        return getattr(connector, name)
    raise AttributeError("module 'mcstore.vllm' has no attribute %r" % name)
