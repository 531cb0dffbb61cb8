"""The study's command lines that do more than one module's work (``python -m study``)."""
