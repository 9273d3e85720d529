"""Rank workers for the pipeline tests (spawned gloo ranks).

One case: the unsharded model and the artifact's with the same weights
(:func:`hpcodegen.parity.harness.build_pair`), tp installed over a ``(pp, tp)`` mesh, the
rank's stages cut by the frozen FQNs and run by the frozen action list
(:class:`hpcodegen.runtime.pipeline_run.PipelineRunner`); the reference takes the whole
batch in one forward/backward with the mean cross entropy. Compared: the loss, the logits
(on the last stage's rank) and every gradient of the parameters this rank's stages own;
the point-to-point ops and bytes counted as posted, with what the frozen list predicts.
"""

from __future__ import annotations

from typing import Any

_MESHES: dict[tuple[int, int], Any] = {}


def mesh_of(pp: int, tp: int) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    if (pp, tp) not in _MESHES:
        _MESHES[(pp, tp)] = init_device_mesh("cpu", (pp, tp), mesh_dim_names=("pp", "tp"))
    return _MESHES[(pp, tp)]


def pp_parity(artifact: str, config_dir: str, pp: int, tp: int, rows: int = 4,
              seq: int = 16) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from hpcodegen.parity.gather import max_param_diff
    from hpcodegen.parity.harness import build_pair, install, read_config, token_batch
    from hpcodegen.plan.schedule import parse_action
    from hpcodegen.runtime.pipeline_run import PipelineRunner, count_p2p
    from hpcodegen.runtime.pipeline_stage import owned_parameters

    torch.set_num_threads(1)
    mesh = mesh_of(pp, tp)
    pair = build_pair(artifact, read_config(config_dir))
    installed = install(pair, mesh)
    pipe = pair.plan.pipeline
    pp_rank = mesh.get_local_rank("pp")
    runner = PipelineRunner(pair.sharded, pipe, pp_rank, mesh.get_group("pp"),
                            torch.device("cpu"), tp)
    vocab = pair.reference.config.vocab_size
    ids, labels = token_batch(vocab, rows, seq)
    labels[0, :3] = -100  # some labels ignored: the normaliser counts valid ones only
    with count_p2p() as seen:
        loss, logits = runner.step(ids, labels)
    ref_logits = pair.reference(input_ids=ids, use_cache=False).logits
    ref_loss = F.cross_entropy(ref_logits.reshape(-1, ref_logits.shape[-1]).float(),
                               labels.reshape(-1), ignore_index=-100)
    ref_loss.backward()
    names = set(owned_parameters(pair.sharded, pipe, pp_rank))
    grad, worst, odd = max_param_diff(pair.sharded, pair.reference, pair.plan,
                                      installed.active, lambda p: p.grad, names=names)
    mine = [parse_action(a) for a in pipe.actions[str(pp_rank)]]
    out = {"pp_rank": pp_rank, "grad": grad, "worst": worst, "odd": odd,
           "n_params": len(names), "ref_loss": float(ref_loss.detach()),
           "isend": seen["isend"], "irecv": seen["irecv"],
           "isend_bytes": seen["isend_bytes"], "irecv_bytes": seen["irecv_bytes"],
           "predicted_sends": sum(a.kind.startswith("SEND") for a in mine),
           "predicted_recvs": sum(a.kind.startswith("RECV") for a in mine)}
    if loss is not None:
        out["loss"] = float(loss)
        out["logits"] = float((logits - ref_logits.detach()).abs().max())
    return out


def pp_parity_cases(cases: list[tuple[str, str, str, int, int]]) -> dict[str, Any]:
    """``{name: pp_parity(...)}`` for ``(name, artifact, config, pp, tp)``; one process
    start for all (errors are reported per case)."""
    import torch.distributed as dist

    out: dict[str, Any] = {}
    for name, *args in cases:
        try:
            out[name] = pp_parity(*args)
        except Exception as exc:
            import traceback

            out[name] = {"error": "".join(traceback.format_exception(exc))[-2500:]}
        dist.barrier()
    return out
