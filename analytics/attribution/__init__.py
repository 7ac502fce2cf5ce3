"""Root-cause attribution of an incident: phases, dimensions, signals, then ranked causes."""

from fleetlens.analytics.attribution.context import IncidentContext, Tables, load_context
from fleetlens.analytics.attribution.rank import attribute, attribute_all

__all__ = ["IncidentContext", "Tables", "attribute", "attribute_all", "load_context"]
