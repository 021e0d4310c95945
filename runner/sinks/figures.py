"""Pictures of results, drawn with Pillow (torchvision's dependency: no plotting library to install): the
confusion matrix as a grid of cells with their counts and the class names."""
from __future__ import annotations

from typing import Any

CELL = 28  # pixels per cell: room for a 3-digit count in Pillow's default font
MAX_CLASSES = 100  # a bigger matrix is no picture anyone reads (and a 1000-class one is 28,000 px wide)


def _shade(count: int, row_total: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(fill, text colour) of a cell: white to dark blue by its share of the true class's images."""
    share = count / row_total if row_total else 0.0
    fill = tuple(int(255 - share * (255 - c)) for c in (8, 48, 107))
    return fill, (255, 255, 255) if share > 0.5 else (0, 0, 0)


def confusion_image(matrix: list[list[int]], names: list[str], title: str) -> Any:
    """The matrix (rows: true class, columns: predicted) as an RGB PIL image, cells shaded by row share."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default()
    n = len(matrix)
    label_w = 8 + max((int(font.getlength(s)) for s in names), default=0)
    top = 2 * CELL + label_w  # the title, "predicted", and the column names written upwards
    left = CELL + label_w
    width = max(left + n * CELL, int(font.getlength(title))) + 8
    img = Image.new("RGB", (width, top + n * CELL + 8), "white")
    draw = ImageDraw.Draw(img)
    draw.text((4, 4), title, fill="black", font=font)
    draw.text((left, CELL + 4), "predicted", fill="black", font=font)
    draw.text((4, top + n * CELL // 2), "true", fill="black", font=font)
    for i, row in enumerate(matrix):
        y = top + i * CELL
        draw.text((CELL, y + CELL // 3), names[i], fill="black", font=font)
        for j, count in enumerate(row):
            fill, ink = _shade(count, sum(row))
            x = left + j * CELL
            draw.rectangle([x, y, x + CELL - 1, y + CELL - 1], fill=fill, outline=(200, 200, 200))
            if count:
                text = str(count)
                draw.text((x + (CELL - font.getlength(text)) / 2, y + CELL // 3), text, fill=ink, font=font)
    _column_names(img, names, left, top, font)
    return img


def _column_names(img: Any, names: list[str], left: int, top: int, font: Any) -> None:
    """The predicted classes' names above the columns, written bottom to top."""
    from PIL import Image, ImageDraw

    for j, name in enumerate(names):
        strip = Image.new("RGB", (int(font.getlength(name)) + 2, CELL // 2), "white")
        ImageDraw.Draw(strip).text((0, 0), name, fill="black", font=font)
        rotated = strip.rotate(90, expand=True)
        img.paste(rotated, (left + j * CELL + CELL // 4, top - 4 - rotated.height))
