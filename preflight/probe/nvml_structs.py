"""The ctypes structures NVML calls fill, defined where NVML answers: importing ctypes costs a node without the
NVIDIA driver (every CPU node, every simulated one) 5-10 ms of CPU a run for nothing.

Standard library only, Python 3.8 compatible: runs on the node inside the probe bundle (preflight.probe.nvml's
call_c passes them to the C functions themselves).
"""

import ctypes

pointer = ctypes.pointer


class NvmlGpuFabricInfo(ctypes.Structure):
    """nvmlGpuFabricInfo_t exactly as nvml.h (R535 onwards) declares it:

        #define NVML_GPU_FABRIC_UUID_LEN 16
        typedef unsigned char nvmlGpuFabricState_t;
        typedef struct {
            unsigned char        clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
            nvmlReturn_t         status;
            unsigned int         cliqueId;
            nvmlGpuFabricState_t state;
        } nvmlGpuFabricInfo_t;

    Defined here, not taken from pynvml: nvidia-ml-py before 13.615 declares clusterUuid as 80 bytes, so
    its structure reads state and status at the wrong offsets (every H100 then looks "not supported").
    Source: nvml.h of the CUDA 12.x nvml_dev headers (also quoted in NVSHMEM's nvml wrapper).
    """

    _fields_ = [
        ("clusterUuid", ctypes.c_ubyte * 16),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_ubyte),
    ]


class FabricInfoV3(ctypes.Structure):
    """nvmlGpuFabricInfo_v3_t as nvml.h (R550+) declares it (v2 is the same without healthSummary):
    unsigned int version; unsigned char clusterUuid[16]; nvmlReturn_t status; unsigned int cliqueId;
    nvmlGpuFabricState_t state (unsigned char); unsigned int healthMask; unsigned char healthSummary.
    Sizes 40 (v3) and 36 (v2): the version words nvmlGpuFabricInfo_v3 0x3000028 and _v2 0x2000024."""

    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_ubyte * 16), ("status", ctypes.c_uint),
                ("cliqueId", ctypes.c_uint), ("state", ctypes.c_ubyte), ("healthMask", ctypes.c_uint),
                ("healthSummary", ctypes.c_ubyte)]
