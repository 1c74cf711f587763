"""Video token and KV accounting for autoregressive video generation (docs/plan.md, Video).

A clip of ``seconds`` at ``fps`` has ``frames = seconds * fps``; a video VAE compresses time by
``temporal_compression`` (``latent_frames = frames // tc``, or ``1 + (frames - 1) // tc`` for a causal VAE that
keeps the first frame on its own) and space by ``spatial_compression`` per side; a ``patch_size`` x
``patch_size`` patchify divides each side again. One latent position is one token, and every token of history
is kept (no eviction). Seed: 5 s, 24 fps, 720p, 4x time, 8x8 space on Llama-3-8B = 30 x 14400 = 432000 tokens =
52.73 GiB. These are assumptions for scale, not any real video model's usage. Pure Python.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvlab.plan.config_fields import check_int_at_least, count_text, number_text
from kvlab.plan.kv_formats import KVDtype
from kvlab.plan.ledger import kv_bytes
from kvlab.plan.spec import ModelSpec


@dataclass(frozen=True)
class VideoClip:
    """A clip and the compression that turns it into tokens."""

    seconds: float  # clip length
    fps: int = 24  # frames per second
    width: int = 1280  # pixels
    height: int = 720  # pixels
    temporal_compression: int = 4  # frames per latent frame
    spatial_compression: int = 8  # pixels per latent position, per side
    # latent positions per token, per side (2 = the extra 2x2 patchify in docs/plan.md, Video)
    patch_size: int = 1
    causal_first_frame: bool = False  # causal VAE: the first frame is its own latent frame

    def __post_init__(self) -> None:
        for name in ("fps", "width", "height", "temporal_compression", "spatial_compression", "patch_size"):
            check_int_at_least(name, getattr(self, name), 1)
        if (
            not isinstance(self.seconds, int | float)
            or isinstance(self.seconds, bool)
            or not self.seconds > 0
            or not math.isfinite(self.seconds * self.fps)
        ):
            raise ValueError(f"`seconds` must be finite and > 0, got {number_text(self.seconds)}")
        frames = self.seconds * self.fps
        if frames >= 2**53:  # past it a float holds no exact whole number: the frame count would be noise
            raise ValueError(
                f"`seconds` {self.seconds:g} x `fps` {number_text(self.fps)} = {frames:.3g} frames; at most 2**53 "
                "frames can be counted exactly"
            )
        if abs(frames - round(frames)) > 1e-9:
            raise ValueError(
                f"`seconds` {number_text(self.seconds)} x `fps` {number_text(self.fps)} = {number_text(frames)} "
                "frames: a clip is a whole number of frames"
            )
        if self.latent_frames < 1:
            raise ValueError(
                f"a clip of {count_text(self.frames, 'frame')} has no latent frame at `temporal_compression` "
                f"{number_text(self.temporal_compression)} (pass --causal-first-frame or a longer clip)"
            )
        side = self.spatial_compression * self.patch_size
        if self.width < side or self.height < side:
            raise ValueError(f"a {self.width}x{self.height} frame has no {side}x{side} token")

    def rounding_warnings(self) -> list[str]:
        """What the token count leaves out of the clip, one sentence each: a ``width`` or ``height`` that is not a
        multiple of a token's side (``spatial_compression * patch_size`` px: the rest of the row or column is
        dropped), and frames past the last whole latent frame (``frames`` not a multiple of
        ``temporal_compression``; with ``causal_first_frame``, not 1 + a multiple). Empty when the clip is used
        whole. The sizes are counted as the VAE would crop them, not refused."""
        side, s, p = self.spatial_compression * self.patch_size, self.spatial_compression, self.patch_size
        out = []
        for name, pixels, used, across in (
            ("width", self.width, self.used_width, "across"),
            ("height", self.height, self.used_height, "down"),
        ):
            if used != pixels:
                latents = f"{count_text(used // s, 'latent')}, " if p > 1 else ""
                out.append(
                    f"`{name}` {number_text(pixels)} is not a multiple of a token's {side} px (`spatial_compression` "
                    f"{s} x `patch_size` {p}): {number_text(used)} px used ({latents}{count_text(used // side, 'token')} "
                    f"{across}), the last {pixels % side} px dropped"
                )
        tc, first, used = self.temporal_compression, 1 if self.causal_first_frame else 0, self.used_frames
        if used != self.frames:
            rule = f"{'1 + ' if first else ''}a multiple of `temporal_compression` {tc}"
            first_alone = " (a causal VAE's first frame is a latent frame of its own)" if first else ""
            out.append(
                f"the {number_text(self.seconds)} s clip's {count_text(self.frames, 'frame')} are not {rule}"
                f"{first_alone}: {count_text(used, 'frame')} used "
                f"({count_text(self.latent_frames, 'latent frame')}), the last {number_text(self.frames - used)} dropped"
            )
        return out

    @property
    def used_width(self) -> int:
        """Pixels of a row the tokens cover: ``width`` rounded down to a multiple of a token's side
        (``spatial_compression * patch_size``; 1281 -> 1280 at 8 px)."""
        return self.width - self.width % (self.spatial_compression * self.patch_size)

    @property
    def used_height(self) -> int:
        """Pixels of a column the tokens cover: ``height`` rounded down as :attr:`used_width`."""
        return self.height - self.height % (self.spatial_compression * self.patch_size)

    @property
    def frames(self) -> int:
        return int(round(self.seconds * self.fps))

    @property
    def used_frames(self) -> int:
        """Frames the latent frames cover: ``latent_frames * temporal_compression`` (1 + that minus one with
        ``causal_first_frame``); fewer than :attr:`frames` where the VAE's stride does not divide them."""
        first = 1 if self.causal_first_frame else 0
        return first + (self.latent_frames - first) * self.temporal_compression

    @property
    def latent_frames(self) -> int:
        tc = self.temporal_compression
        return 1 + (self.frames - 1) // tc if self.causal_first_frame else self.frames // tc

    @property
    def tokens_per_frame(self) -> int:
        """Tokens of one latent frame: ``(h // (s*P)) * (w // (s*P))`` (720p, s = 8, P = 1: 90 x 160 = 14400)."""
        side = self.spatial_compression * self.patch_size
        return (self.height // side) * (self.width // side)

    @property
    def tokens(self) -> int:
        return self.latent_frames * self.tokens_per_frame

    def to_dict(self) -> dict[str, Any]:
        """The clip's fields and counts; ``width`` and ``height`` are the pixels the tokens cover
        (:attr:`used_width`, :attr:`used_height`), ``width_given`` and ``height_given`` the sizes asked for (larger
        where the compression does not divide them: :meth:`rounding_warnings`); ``frames`` the clip's,
        ``frames_used`` those its latent frames cover (:attr:`used_frames`)."""
        return {
            "seconds": self.seconds,
            "fps": self.fps,
            "width": self.used_width,
            "height": self.used_height,
            "width_given": self.width,
            "height_given": self.height,
            "temporal_compression": self.temporal_compression,
            "spatial_compression": self.spatial_compression,
            "patch_size": self.patch_size,
            "causal_first_frame": self.causal_first_frame,
            "frames": self.frames,
            "frames_used": self.used_frames,
            "latent_frames": self.latent_frames,
            "tokens_per_frame": self.tokens_per_frame,
            "tokens": self.tokens,
        }


def video_kv(spec: ModelSpec, clip: VideoClip, kv: str | KVDtype = "auto", batch: int = 1) -> dict[str, Any]:
    """Tokens and KV bytes of ``batch`` clips on ``spec`` (whole history kept; sliding layers window-capped).

    Returns the clip's fields plus ``kv_bytes`` (exact) and ``kv_bytes_first_latent_frame`` (the cache of the
    first latent frame: 1.76 GiB per frame in docs/plan.md, Video on Llama-3-8B; window-capped layers add less later on).
    """
    total = kv_bytes(spec, clip.tokens, batch, kv)
    per_frame = kv_bytes(spec, clip.tokens_per_frame, batch, kv)
    return {**clip.to_dict(), "batch": batch, "kv_bytes": total, "kv_bytes_first_latent_frame": per_frame}
