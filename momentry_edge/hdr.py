"""HDR video (PQ, HLG; BT.2020) tone mapped to the 8-bit SDR BT.709 the models know.

Phones record HLG by default and graded video is often PQ. Converted as if it were SDR,
such a picture comes out dim and grey (PQ's diffuse white is about code 150 of 255), so
faces, people and text are missed and thumbnails look wrong. Here a frame's 16-bit RGB
(BT.2020, still PQ- or HLG-encoded) becomes display light in nits (the PQ EOTF; for HLG
the inverse OETF and the OOTF of a 1000-nit display, BT.2100), is brought into BT.709's
primaries, has its highlights above SDR white (203 nits, BT.2408) rolled off with
BT.2390's EETF on the brightest channel (hue kept), and is encoded with a 2.4 gamma
(BT.1886). Lookup tables keep it to a few milliseconds at the processors' working sizes.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

PQ, HLG = "pq", "hlg"
# FFmpeg's AVColorTransferCharacteristic values that say a frame is HDR.
_TRANSFERS = {16: PQ, 18: HLG}  # SMPTE ST 2084, ARIB STD-B67

SDR_WHITE = 203.0  # nits of diffuse white (BT.2408): SDR's 255
HLG_PEAK = 1000.0  # the nominal display HLG is shown on (system gamma 1.2)
PQ_PEAK = 1000.0  # the mastering peak assumed for PQ (most content is graded to it)

# BT.2087: linear BT.2020 RGB -> linear BT.709 RGB.
_BT2020_TO_BT709 = (
    (1.6605, -0.5876, -0.0728),
    (-0.1246, 1.1329, -0.0083),
    (-0.0182, -0.1006, 1.1187),
)
_BT2020_LUMA = (0.2627, 0.6780, 0.0593)

_M1, _M2 = 2610 / 16384, 2523 / 4096 * 128
_C1, _C2, _C3 = 3424 / 4096, 2413 / 4096 * 32, 2392 / 4096 * 32
_HLG_A, _HLG_B, _HLG_C = 0.17883277, 0.28466892, 0.55991073


def transfer(frame: Any) -> str | None:
    """The HDR transfer ("pq" or "hlg") of a frame (or codec context), None for SDR."""
    return _TRANSFERS.get(int(frame.color_trc or 0))


def pq_to_nits(signal: np.ndarray) -> np.ndarray:
    """SMPTE ST 2084's EOTF: a PQ signal in [0, 1] to display light in nits."""
    import numpy as np

    p = np.power(np.clip(signal, 0, 1), 1 / _M2)
    return 10000 * np.power(np.maximum(p - _C1, 0) / (_C2 - _C3 * p), 1 / _M1)


def nits_to_pq(nits: np.ndarray) -> np.ndarray:
    """The inverse of ``pq_to_nits``."""
    import numpy as np

    y = np.power(np.clip(nits, 0, 10000) / 10000, _M1)
    return np.power((_C1 + _C2 * y) / (1 + _C3 * y), _M2)


def hlg_to_scene(signal: np.ndarray) -> np.ndarray:
    """BT.2100's inverse HLG OETF: a signal in [0, 1] to scene light in [0, 1]."""
    import numpy as np

    e = np.clip(signal, 0, 1)
    high = (np.exp((e - _HLG_C) / _HLG_A) + _HLG_B) / 12
    return np.where(e <= 0.5, e * e / 3, high)


def _eetf_table(peak: float, size: int = 1024) -> tuple[np.ndarray, np.ndarray, float]:
    """BT.2390's EETF from [0, ``peak``] nits to [0, SDR_WHITE], as (in, out, knee) in
    units of SDR white, sampled evenly in PQ: below its knee (about 95 nits) light is kept."""
    import numpy as np

    top = nits_to_pq(np.array(peak))
    e = np.linspace(0, 1, size)  # the source's PQ range, normalised
    target = nits_to_pq(np.array(SDR_WHITE)) / top
    knee = 1.5 * target - 0.5
    t = (e - knee) / (1 - knee)
    spline = (
        (2 * t**3 - 3 * t**2 + 1) * knee
        + (t**3 - 2 * t**2 + t) * (1 - knee)
        + (-2 * t**3 + 3 * t**2) * target
    )
    mapped = np.where(e < knee, e, spline)
    return (
        pq_to_nits(e * top) / SDR_WHITE,
        pq_to_nits(mapped * top) / SDR_WHITE,
        float(pq_to_nits(knee * top) / SDR_WHITE),
    )


_STEPS = 4096


# Made at the first HDR frame, not at import: probing a file (hdr.transfer) needs none of it.
@functools.cache
def _tables() -> dict[str, Any]:
    import numpy as np

    codes = np.arange(65536, dtype=np.float64) / 65535
    light_in, light_out, knee = _eetf_table(max(PQ_PEAK, HLG_PEAK))
    # The brightest channel's light, on a square-root scale up to the peak -> the factor
    # the EETF scales the pixel by (1 below the knee).
    top = float(light_in[-1])
    brightest = np.square(np.linspace(0, 1, _STEPS)) * top
    rolled = np.interp(brightest, light_in, light_out)
    factor = np.divide(rolled, brightest, out=np.ones_like(rolled), where=brightest > knee)
    return {
        # 16-bit code -> light: PQ in units of SDR white; HLG scene light (OOTF to come).
        PQ: (pq_to_nits(codes) / SDR_WHITE).astype(np.float32),
        HLG: hlg_to_scene(codes).astype(np.float32),
        # Scene luminance in [0, 1] on a square-root scale -> the HLG OOTF's gain.
        "ootf": (HLG_PEAK / SDR_WHITE * np.power(np.linspace(0, 1, _STEPS) ** 2, 0.2)).astype(
            np.float32
        ),
        "rolloff": factor.astype(np.float32),
        "rolloff_scale": np.float32((_STEPS - 1) / np.sqrt(top)),
        # Light in [0, 1] on a square-root scale (fine steps near black) -> 8-bit, gamma 2.4.
        "encode": np.round(255 * np.power(codes, 2 / 2.4)).astype(np.uint8),
        "to_bt709": np.array(_BT2020_TO_BT709, np.float32).T,
        "luma": np.array(_BT2020_LUMA, np.float32),
    }


def to_sdr(rgb48: np.ndarray, kind: str) -> np.ndarray:
    """An HxWx3 uint16 RGB frame in ``kind`` ("pq" or "hlg", BT.2020) as HxWx3 uint8
    SDR BT.709 RGB."""
    import numpy as np

    tables = _tables()
    light = tables[kind][rgb48]  # float32, per channel
    if kind == HLG:
        # The OOTF: a 1000-nit display lifts light by its luminance to the power 0.2.
        luma = np.minimum(light @ tables["luma"], 1)
        light *= tables["ootf"][(np.sqrt(luma) * (_STEPS - 1) + 0.5).astype(np.int32)][..., None]
    light = light @ tables["to_bt709"]
    np.maximum(light, 0, out=light)  # colours outside BT.709: clipped
    brightest = np.maximum(np.maximum(light[..., 0], light[..., 1]), light[..., 2])
    # Highlights rolled off on the brightest channel, the others scaled alike (hue kept).
    steps = np.minimum(np.sqrt(brightest) * tables["rolloff_scale"] + 0.5, _STEPS - 1)
    light *= tables["rolloff"][steps.astype(np.int32)][..., None]
    np.minimum(light, 1, out=light)
    return tables["encode"][(np.sqrt(light) * 65535 + 0.5).astype(np.int32)]
