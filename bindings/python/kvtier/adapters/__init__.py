"""Engine adapters: thin classes with the method names and semantics of an engine's own storage
interface, so that the engine can be pointed at kvtier by configuration alone.

- kvtier.adapters.sglang.KvtierHiCacheStorage: SGLang's hierarchical-cache storage backend
  (HiCacheStorage: batch_exists / batch_get / batch_set and the zero-copy batch_get_v1 / batch_set_v1).
- kvtier.adapters.vllm.KvtierConnector: a vLLM v1 KV connector (KVConnectorBase_V1:
  get_num_new_matched_tokens, update_state_after_alloc, build_connector_meta, start_load_kv,
  wait_for_save, ...).

Neither engine is imported unless it is installed; without it the classes still work against any
object with the same attributes (the tests use small engine stand-ins). bindings/python/README.md
lists the engine versions and interfaces they target and the block arithmetic of each.
"""
