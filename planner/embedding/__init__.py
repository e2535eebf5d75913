"""Recommendation models (DLRM): embedding-table sharding and HBM caching, its cost model, the CP-SAT
search (compile, program), the sharding plan file and its checks."""
