"""The mps-agent: a long-lived per-node process that owns the MPS control daemons.

MPS daemons never run in the kubelet plugin, so a plugin restart or rolling
update does not kill a running client. The plugin asks the agent over a unix
socket (:mod:`.protocol`, :mod:`.client`) to ensure a GPU's daemon and a share's
limits, and to release them; the agent (:mod:`.agent`) supervises one daemon per
GPU (:mod:`.daemon`) and restores every live share's limits after a daemon dies.

Public surface (imported from the modules, so that the fake control executable,
:mod:`dra_driver.fakes.mps_control`, which imports :mod:`.procs`, stays light):

* :class:`.agent.AgentConfig`, :class:`.agent.MpsAgent` (built and run by
  :func:`dra_driver.app.agent.run_agent`)
* :class:`.client.MpsAgentClient`, :class:`.client.MpsAgentError`,
  :class:`.client.MpsAgentUnavailableError`
* :class:`.port.MpsAgentPort`: the client as the plugin depends on it (one Protocol)
* :func:`.commands.share_cdi_edits` (pure: env and mounts for a share's containers)
* :class:`.compute_mode.ComputeMode`, :class:`.compute_mode.FakeComputeMode`,
  :class:`.compute_mode.NvidiaSmiComputeMode`
* :class:`.metrics.AgentMetrics`: the agent's Prometheus metrics (beside the agent, so
  that ``observability/`` never imports ``mpsagent/``)

The fake ``nvidia-cuda-mps-control`` (``--mps-control fake``) is
:mod:`dra_driver.fakes.mps_control`; its launcher is
:func:`dra_driver.fakes.mps_control.fake_control_path`.
"""
