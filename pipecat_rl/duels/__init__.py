"""People in the loop: preference duels on one moment of a call, and the judge's calibration.

`make` queues duels (two policies' replies sampled from a recorded turn's very prompt ids);
`page` renders one for a person (the side service's `/duels`); the votes live in the ledger
(`ledger.duels`), and DPO trains on them (`training.dpo`). `calibration` measures the LLM
judge against people's labels of the same calls (Cohen's κ, `kappa`), the rule the cycle's
`live:` applies before judge-scored calls may train.
"""

from pipecat_rl.duels.calibration import Calibration, JudgeCalibrationSettings, calibrate
from pipecat_rl.duels.kappa import Kappa, cohen_kappa

__all__ = ["Calibration", "JudgeCalibrationSettings", "Kappa", "calibrate", "cohen_kappa"]
