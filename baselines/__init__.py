"""Built-in baselines: importing this package registers every one of them (``stabledrl_bench.core.registry``).

One file per method, each = a pure loss function with the official formula in its docstring + a small
registered ``Baseline`` subclass (Config, estimator, advantages, loss):

==========================  ===================  ===============================================================
name                        file                 in one line
==========================  ===================  ===============================================================
``grpo``                    ``grpo.py``          d1: token-level conditional PPO clip, k3 KL to the reference
``spg``                     ``spg.py``           SPG: REINFORCE on the ELBO/EUBO sandwich, no ratio
``espo``                    ``espo.py``          ESPO: sequence-level PPO clip on exp(dELBO / L), k2 KL
``trado``                   ``trado.py``         TraceRL: token PPO clip on trajectory replay, k3 KL vs old
``stabledrl``               ``stabledrl.py``     StableDRL: SPG sandwich x clipped, self-normalised IS weights
``stabledrl_clip_only``     ``ablations.py``     ablation: clip, fixed 1/G normalisation
``stabledrl_selfnorm_only`` ``ablations.py``     ablation: self-normalisation, no clip
``wd1``                     ``wd1.py``           wd1: ratio-free likelihood, softmax(A) up / softmax(-A) down
``coupled_grpo``            ``coupled_grpo.py``  DiffuCoder: d1 token PPO on complementary-mask estimates
``gdpo``                    ``gdpo.py``          GDPO: sequence PPO clip on a Gauss-quadrature ELBO, no KL
``cj_grpo``                 ``cj_grpo.py``       CJ-GRPO: d1 token PPO on the replayed sampling trajectory
``agrpo``                   ``agrpo.py``         AGRPO: token PPO on Monte-Carlo sampled steps of the trajectory
``justgrpo``                ``justgrpo.py``      JustGRPO: GRPO on the exact left-to-right likelihood
``gdsd``                    ``gdsd.py``          GDSD: clamped change of the denoising log-prob regressed on A
``bgpo``                    ``bgpo.py``          BGPO: PPO linear in each ELBO sample, dual clip (DARE's port)
``egspo``                   ``egspo.py``         EGSPO: step PPO on the highest-entropy sampler steps, stepwise A
``mdpo``                    ``mdpo.py``          MDPO: token PPO on the steps of largest |A|, every prediction rewarded
``dtreerpo``                ``dtreerpo.py``      d-TreeRPO: token PPO on rollout-tree transitions, self-distillation
``igpo``                    ``igpo.py``          IGPO: all-wrong groups re-decoded with solution hints, token PPO
==========================  ===================  ===============================================================

Metrics every loss returns where they mean something, under the same names so runs overlay in one plot:
``loss``; ``ratio_mean`` / ``ratio_max`` / ``ratio_var`` of the unclipped importance ratios (per valid token or
per sequence); ``clip_ratio`` (fraction of ratios whose clip is active: the zero-gradient branch of a
conditional clip, or outside the range of an unconditional one); ``drift`` = mean |log rho| against the rollout
policy (= mean |Delta ELBO| for StableDRL); ``kl`` (the KL penalty before beta, where there is one);
``weight_max`` (StableDRL family); ``adv_abs_mean``.

Precision, the same for every loss and advantage rule: they compute and return in
``stabledrl_bench.core.advantages.compute_dtype`` of their inputs, promote_types(input dtypes, float32), so bf16 / fp16
inputs are upcast to float32 and float64 stays float64. Exponentials of log-ratios never overflow into inf x 0
(``grpo.scaled_exp``): a term is +-inf only where its exact value is beyond the dtype's range.
"""

from importlib import import_module

BUILTIN_MODULES = (
    "grpo",
    "spg",
    "espo",
    "trado",
    "stabledrl",
    "ablations",
    "wd1",
    "coupled_grpo",
    "gdpo",
    "cj_grpo",
    "agrpo",
    "justgrpo",
    "gdsd",
    "bgpo",
    "egspo",
    "mdpo",
    "dtreerpo",
    "igpo",
)  # registration (= listing) order

for _module in BUILTIN_MODULES:
    import_module(f"{__name__}.{_module}")
