"""The two-node cluster's slurm.conf and /etc/hosts, written for the namespaces' addresses: the
daemons bind their node's address only, and nothing needs cgroups or an accounting database."""

from __future__ import annotations

from pathlib import Path

from helpers.dist.netns import VethPair

NODES = ("node1", "node2")  # each namespace's host name and Slurm node name
SLURMCTLD_PORT, SLURMD_PORT = 6817, 6818


def write_config(root: Path, pair: VethPair, nodes: tuple[str, str] = NODES) -> Path:
    """slurm.conf for the two namespaces: everything under ``root``, everything as root,
    no cgroup plugin (``proctrack/linuxproc``, ``task/none``), munge's socket in ``root``."""
    node_lines = [
        f"NodeName={name} NodeAddr={address} NodeHostname={name} CPUs=1 State=UNKNOWN"
        for name, address in zip(nodes, pair.addresses, strict=True)
    ]
    text = f"""\
# written by helpers.dist.slurm_cluster for a cluster in two network namespaces on one machine
ClusterName=ddpcourse
SlurmctldHost={nodes[0]}({pair.addresses[0]})
SlurmctldPort={SLURMCTLD_PORT}
SlurmdPort={SLURMD_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge.socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig={root}/plugstack.conf
TmpFS={root}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={root}/jobcomp.log
MinJobAge=3600
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
SlurmdParameters=config_overrides
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
{chr(10).join(node_lines)}
PartitionName=course Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
    conf = root / "slurm.conf"
    conf.write_text(text)
    (root / "plugstack.conf").write_text("")
    return conf

def hosts_file(addresses: tuple[str, str], nodes: tuple[str, str]) -> str:
    """Both nodes' ``/etc/hosts``: their names and addresses, and the same as IPv4-mapped IPv6
    addresses, which is how torch's store, listening on IPv6, sees IPv4 peers (without them
    each connection logs that its peer's name cannot be found)."""
    lines = ["127.0.0.1 localhost", "::1 localhost", "::ffff:127.0.0.1 localhost"]
    lines += [f"{a} {n}" for a, n in zip(addresses, nodes, strict=True)]
    lines += [f"::ffff:{a} {n}" for a, n in zip(addresses, nodes, strict=True)]
    return "\n".join([*lines, ""])
