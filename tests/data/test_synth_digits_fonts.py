"""SynthDigits is rendered only from the fonts matplotlib ships, so the domain is the same on every machine."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from fedhet.data import synth_digits as sd
from fedhet.errors import FedhetError


def _glyph(font_path: Path, text: str) -> bytes:
    img = Image.new("L", (40, 40), 0)
    ImageDraw.Draw(img).text((4, 0), text, fill=255, font=ImageFont.truetype(str(font_path), 28))
    return np.asarray(img).tobytes()


def test_fonts_are_matplotlibs_and_have_digits() -> None:
    fonts = sd.find_fonts()
    assert len(fonts) == len(sd.SHIPPED_FONTS) == 21
    assert all(p.parent == sd.font_dir() and p.is_file() for p in fonts)
    blank = bytes(40 * 40)
    for p in fonts:  # every digit drawn, and drawn differently (a symbol or fallback font draws boxes or nothing)
        glyphs = [_glyph(p, str(d)) for d in range(10)]
        assert blank not in glyphs and len(set(glyphs)) == 10, p.name


def test_generation_renders_only_shipped_fonts(monkeypatch: pytest.MonkeyPatch) -> None:
    used: list[str] = []
    real = ImageFont.truetype

    def spy(path: str, size: int) -> ImageFont.FreeTypeFont:
        used.append(path)
        return real(path, size)

    monkeypatch.setattr(sd.ImageFont, "truetype", spy)
    x, _ = sd.generate_synth_digits.__wrapped__(60, 11)
    mpl_fonts = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    assert used and all(Path(u).parent == mpl_fonts for u in used) and len(set(used)) >= 10
    again, _ = sd.generate_synth_digits.__wrapped__(60, 11)
    assert np.array_equal(x, again)


def test_missing_shipped_font_is_one_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sd, "font_dir", lambda: tmp_path)
    sd.find_fonts.cache_clear()
    try:
        with pytest.raises(FedhetError, match="reinstall matplotlib") as e:
            sd.find_fonts()
        assert "\n" not in str(e.value)
    finally:
        sd.find_fonts.cache_clear()
