"""Language models: the embedded SmolLM2-135M and run folders (:mod:`~dsh.llm.models`), a tiny Llama with an
alphabet tokenizer (:mod:`~dsh.llm.tiny`), fast generation (:mod:`~dsh.llm.engine`), padding-free packing
(:mod:`~dsh.llm.packing`), memory and batch sizes (:mod:`~dsh.llm.scale`) and gradient attribution inside a
transformer (:mod:`~dsh.llm.attribution`). Imports only the layers below (core .. measure)."""
