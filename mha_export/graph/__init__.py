"""The ONNX graph: builder helpers and the one mask builder (``builder``), the graph forms of the
attention core (``forms/``, a registry), and the model assembly (``model``)."""
