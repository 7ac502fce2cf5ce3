"""Root-cause attribution of an incident: phases, dimensions, signals, then ranked causes."""

from analytics.attribution.context import IncidentContext, Tables, load_context
from analytics.attribution.rank import attribute, attribute_all

__all__ = ["IncidentContext", "Tables", "attribute", "attribute_all", "load_context"]
