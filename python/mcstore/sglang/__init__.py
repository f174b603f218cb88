"""mcstore as SGLang's HiCache storage tier (L3): a HiCacheStorage backend loaded through
SGLang's dynamic-backend option, without patching SGLang:

    python -m sglang.launch_server --model-path /models/llama --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic --hicache-mem-layout page_first \\
        --hicache-storage-backend-extra-config '{"backend_name": "mcstore",
            "module_path": "mcstore.sglang", "class_name": "MCStoreStorage",
            "interface_v1": 1, "allocator": "shm",
            "address": "unix:/run/mcstore/client.sock"}'

"allocator": "shm" puts SGLang's host KV pool in a memfd that the backend lends to mc-client, and
"interface_v1": 1 has SGLang pass host page indices: pages then move between the host pool and
mcstore without a copy. See docs/sglang.md. MCStoreStorage is imported on first use (it imports
SGLang)."""

from typing import Any

__all__ = ["MCStoreStorage"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from mcstore.sglang import storage
        return getattr(storage, name)
    raise AttributeError("module 'mcstore.sglang' has no attribute %r" % name)
