"""Language models in traceap: the backends that reach one (`backend`) and what it reads and
must answer (`prompt`: the window digest, the answer schemas, their validation).

A layer below both users, the LLM classifier (`traceap.classify.llm`) and the pure-LLM detector
(`traceap.detectors.llm`), so that detectors and classifiers never import each other.  The
packaged GGUF models and the llama.cpp server are `setup` (`traceap llm list/fetch/serve`).
"""
