"""The HTTP layer: routes for both path families (the Agent Protocol's and LangGraph's) over one core."""
