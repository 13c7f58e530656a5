"""A gallery of graph styles, written as LangGraph's docs teach them, served from `langgraph.json` here.

Every graph is deterministic and needs no network or API key (chat models are fakes). The same folder is
served by Threadline (tests/test_gallery.py) and, in the differential suite, by LangGraph's own server too
(tests/differential/).
"""
