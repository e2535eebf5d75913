"""Plan for the data: a length/modality profile, per-sequence costs, packing, bucketing and balancing."""

from planner.data.profile import DataProfile, load_data_profile
from planner.data.result import DataPlan

__all__ = ["DataPlan", "DataProfile", "load_data_profile"]
