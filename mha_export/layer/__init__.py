"""The eager PyTorch layer: the attention core (``attention``), rotary embeddings (``rotary``),
the four weight layouts that compute one function (``layouts``) and the entry point of each call
kind (``entry``): what every export is made from and every check compares against."""
