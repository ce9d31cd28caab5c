"""cloud_fabric: each node's cloud GPU fabric is recognised from its own facts and has what that fabric needs.

Fabrics, recognised on the node (never through a cloud API, which nodes may not reach):
- efa     AWS Elastic Fabric Adapter: devices under class/infiniband bound to the efa driver
          (preflight.probe.rdma.is_efa), `fi_info -p efa` when libfabric's fi_info is on PATH or in /opt/amazon/efa/bin, the
          instance type from DMI (class/dmi/id/product_name: "p5.48xlarge" on Nitro instances), the
          aws-ofi-nccl plugin (libnccl-net*.so under /opt/amazon/ofi-nccl or /opt/aws-ofi-nccl).
- tcpx    Google GPUDirect-TCPX (A3 High): the plugin directory (/usr/local/tcpx or /var/lib/tcpx), the
          receive-datapath manager running (process tcpgpudmarxd), the gVNIC GPU NICs (driver gve).
- tcpxo   Google GPUDirect-TCPXO (A3 Mega): the plugin directory (/usr/local/tcpxo or /var/lib/tcpxo), the
          RxDM running (process fastrak_gpumem_manager; /proc/PID/comm keeps its first 15 characters).
- gib     Google's gIB RDMA plugin over RoCE (A3 Ultra, A4): /usr/local/gib/lib64; the RoCE rails are ib_hca's.
- ib      InfiniBand/RoCE HCAs without a cloud plugin: ib_hca judges them; this check SKIPs.
- mixed   more than one of the above on one node: WARN naming them; none of them: SKIP.

Rule decisions (expectations and their sources in rule.py):
- EFA devices fewer than the instance type has by design (p4d/p4de 4, p5/p5e 32, p5en 16, p6-b200 8): FAIL
  (fix_config: the instance was launched with fewer EFA interfaces). An instance type not in the table: PASS
  saying the count was not judged against a documented value (ib_hca compares it with the other EFA nodes).
- no aws-ofi-nccl plugin on an EFA node of a multi-node run: FAIL (fix_config): NCCL falls back to its socket
  transport over the ENA at about a tenth of EFA's bandwidth. On a single-node run: PASS saying it is needed
  only across nodes (the healthy twin). fi_info present but listing no efa provider: FAIL.
- TCPX/TCPXO: GPU NICs (gve interfaces other than the first, the host NIC) fewer than 4 (TCPX) / 8 (TCPXO),
  or one whose MTU is not 8244: FAIL; the RxDM not running or the plugin absent on a multi-node run: FAIL.
- aws-ofi-nccl beside the NCCL the node's jobs load (compat.py, from the plugin's release notes): a pair the
  notes rule out FAILs (fix_config) on a multi-node run; a pair they do not cover is said unknown. Google's
  plugins are compared with the NCCL their installer ships beside them, never failed.
- EFA hw_counters (efa_counters.py says which are faults, from the efa driver's source): a fault counter that
  grew since the previous run (--history) WARNs, no_completion_cmds (the device stopped completing its
  driver's admin commands) FAILs with reboot; one reading alone is shown, never judged (no threshold is
  documented); traffic and retransmission counters are never judged.
- the nodes of one run on different fabrics: FAIL (cluster), NCCL cannot join them over one net plugin.
Unproven without the hardware: the plugin directories and the RxDM process names follow Google's and AWS's
published install layouts (rule.py cites them); no capture of a live node's /proc was available.
"""

from __future__ import annotations

from preflight.model import Check

NAME = "cloud_fabric"

CHECK = Check(
    name=NAME,
    claim="Each node's cloud GPU fabric (EFA, GPUDirect-TCPX/TCPXO, gIB) is recognised and has its devices, "
    "NICs at the documented count and MTU, plugin and receive-datapath manager",
    why="Without the fabric's NCCL plugin (aws-ofi-nccl, the TCPX/TCPXO/gIB plugins) or its devices, NCCL "
    "silently falls back to TCP sockets at about a tenth of the bandwidth, or fails at init.",
    fix="Launch the instance with every EFA interface / GPU NIC its type has; install aws-ofi-nccl (the EFA "
    "installer) or Google's plugin installer; start the RxDM; set the GPU NICs' VPC MTU to 8244.",
    needs=("ssh",),
    action="fix_config",
    reads="sysfs class/infiniband (EFA hw_counters too), class/net/*/{mtu,ifindex,device/uevent}, class/dmi/id/product_name; "
    "fi_info -p efa; plugin directories; /proc/*/comm",
    takes="< 0.5 s",
    order=62,
)
