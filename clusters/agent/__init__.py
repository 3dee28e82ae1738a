"""The node agent: samples NVML on a GPU node and posts batches to the portal.

    python -m clusters.agent --portal https://gpupool.example --token-file /etc/gpupool/token

Modules: nvml (reading the GPUs), procmap (process -> workload), shipper (bounded buffer,
retries), main (the loop and its command line).
"""
