"""Read and write images without Pillow.

CodefyUI reads and writes images with Pillow/torchvision; cdui does not
depend on them. When Pillow is importable it is used (every format it knows);
otherwise this module handles what a training graph meets in practice:

- read: PNG (8/16-bit, grey, grey+alpha, RGB, RGBA, palette, not interlaced),
  BMP (24/32-bit, uncompressed), PPM/PGM (binary P5/P6);
- write: PNG and BMP.

An image is ``(width, height, mode, pixels)`` with ``mode`` one of ``L``,
``LA``, ``RGB``, ``RGBA`` and ``pixels`` the row-major 8-bit samples.
"""
from __future__ import annotations

import importlib
import struct
import zlib
from pathlib import Path

CHANNELS = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4}
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
_PNG_SIG = b"\x89PNG\r\n\x1a\n"


class ImageFormatError(ValueError):
    pass


def _pillow():
    try:
        return importlib.import_module("PIL.Image")
    except ImportError:
        return None


# -- reading -------------------------------------------------------------------
def read_image(path: Path) -> tuple[int, int, str, bytes]:
    data = Path(path).read_bytes()
    if data.startswith(_PNG_SIG):
        return _read_png(data)
    if data[:2] == b"BM":
        return _read_bmp(data)
    if data[:2] in (b"P5", b"P6"):
        return _read_pnm(data)
    image_mod = _pillow()
    if image_mod is not None:
        with image_mod.open(path) as img:
            img.load()
            mode = img.mode if img.mode in CHANNELS else ("RGBA" if "A" in img.mode else "RGB")
            img = img.convert(mode)
            return img.width, img.height, mode, img.tobytes()
    raise ImageFormatError(f"cannot read {Path(path).name}: only PNG, BMP, PPM and PGM can be "
                           f"read without Pillow; install Pillow for JPEG/TIFF/WebP")


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def _read_png(data: bytes) -> tuple[int, int, str, bytes]:
    pos, idat, palette, trns = 8, bytearray(), None, None
    width = height = depth = ctype = interlace = 0
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
        elif kind == b"PLTE":
            palette = body
        elif kind == b"tRNS":
            trns = body
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    if interlace:
        raise ImageFormatError("interlaced PNG needs Pillow; re-save the image without interlacing")
    samples = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}.get(ctype)
    if samples is None or depth not in (1, 2, 4, 8, 16) or (depth < 8 and ctype not in (0, 3)):
        raise ImageFormatError(f"unsupported PNG (colour type {ctype}, bit depth {depth})")
    raw = zlib.decompress(bytes(idat))
    bits = samples * depth
    stride = (width * bits + 7) // 8
    bpp = max(1, bits // 8)
    rows, prev, off = [], bytearray(stride), 0
    for _ in range(height):
        ftype, line = raw[off], bytearray(raw[off + 1:off + 1 + stride])
        off += 1 + stride
        if ftype == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif ftype == 2:
            for i in range(stride):
                line[i] = (line[i] + prev[i]) & 0xFF
        elif ftype == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif ftype == 4:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                up_left = prev[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + _paeth(left, prev[i], up_left)) & 0xFF
        elif ftype != 0:
            raise ImageFormatError(f"corrupt PNG: unknown filter type {ftype}")
        rows.append(line)
        prev = line
    out = bytearray()
    for line in rows:
        if depth == 16:
            out += line[0::2]  # high byte: 16-bit samples scaled to 8 bits
        elif depth == 8:
            out += line
        else:  # packed 1/2/4-bit grey or palette indices
            per, mask = 8 // depth, (1 << depth) - 1
            for x in range(width):
                v = (line[x // per] >> ((per - 1 - x % per) * depth)) & mask
                out.append(v if ctype == 3 else v * 255 // mask)
    if ctype == 3:
        if palette is None:
            raise ImageFormatError("corrupt PNG: palette image without PLTE")
        alpha = trns or b""
        has_alpha = bool(alpha)
        px = bytearray()
        for i in out:
            px += palette[3 * i:3 * i + 3]
            if has_alpha:
                px.append(alpha[i] if i < len(alpha) else 255)
        return width, height, "RGBA" if has_alpha else "RGB", bytes(px)
    mode = {0: "L", 2: "RGB", 4: "LA", 6: "RGBA"}[ctype]
    return width, height, mode, bytes(out)


def _read_bmp(data: bytes) -> tuple[int, int, str, bytes]:
    offset = struct.unpack("<I", data[10:14])[0]
    width, height, _, bpp, compression = struct.unpack("<iiHHI", data[18:34])
    if bpp not in (24, 32) or compression not in (0, 3):
        raise ImageFormatError(f"BMP with {bpp} bits per pixel / compression {compression} needs Pillow")
    top_down, height = height < 0, abs(height)
    step = bpp // 8
    stride = (width * step + 3) & ~3
    out = bytearray()
    for r in range(height):
        src = r if top_down else height - 1 - r
        row = data[offset + src * stride: offset + src * stride + width * step]
        for x in range(width):
            b, g, rr = row[x * step:x * step + 3]
            out += bytes((rr, g, b))
            if step == 4:
                out.append(row[x * step + 3])
    return width, height, "RGBA" if step == 4 else "RGB", bytes(out)


def _read_pnm(data: bytes) -> tuple[int, int, str, bytes]:
    fields: list[int] = []
    pos = 2
    while len(fields) < 3:
        while data[pos:pos + 1].isspace():
            pos += 1
        if data[pos:pos + 1] == b"#":
            pos = data.index(b"\n", pos) + 1
            continue
        start = pos
        while not data[pos:pos + 1].isspace():
            pos += 1
        fields.append(int(data[start:pos]))
    width, height, maxval = fields
    pos += 1
    mode = "L" if data[:2] == b"P5" else "RGB"
    n = width * height * CHANNELS[mode]
    if maxval > 255:
        raw = data[pos:pos + 2 * n]
        px = bytes(min(255, (raw[i] << 8 | raw[i + 1]) * 255 // maxval) for i in range(0, 2 * n, 2))
    else:
        px = bytes(data[pos:pos + n]) if maxval == 255 else bytes(v * 255 // maxval for v in data[pos:pos + n])
    return width, height, mode, px


# -- writing -------------------------------------------------------------------
def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def encode_png(width: int, height: int, mode: str, pixels: bytes) -> bytes:
    ch = CHANNELS[mode]
    ctype = {"L": 0, "LA": 4, "RGB": 2, "RGBA": 6}[mode]
    stride = width * ch
    raw = b"".join(b"\x00" + pixels[r * stride:(r + 1) * stride] for r in range(height))
    return (_PNG_SIG + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, ctype, 0, 0, 0))
            + _chunk(b"IDAT", zlib.compress(raw, 6)) + _chunk(b"IEND", b""))


def encode_bmp(width: int, height: int, mode: str, pixels: bytes) -> bytes:
    ch = CHANNELS[mode]
    out_step = 4 if mode in ("RGBA", "LA") else 3
    stride = (width * out_step + 3) & ~3
    body = bytearray()
    for r in range(height - 1, -1, -1):
        row = bytearray()
        for x in range(width):
            px = pixels[(r * width + x) * ch:(r * width + x + 1) * ch]
            rgb = (px[0], px[0], px[0]) if ch <= 2 else (px[0], px[1], px[2])
            row += bytes((rgb[2], rgb[1], rgb[0]))
            if out_step == 4:
                row.append(px[-1])
        body += row + b"\x00" * (stride - len(row))
    header = struct.pack("<2sIHHI", b"BM", 54 + len(body), 0, 0, 54)
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, out_step * 8, 0, len(body), 2835, 2835, 0, 0)
    return header + info + bytes(body)


def write_image(path: Path, width: int, height: int, mode: str, pixels: bytes, fmt: str) -> None:
    fmt = fmt.upper()
    if fmt == "PNG":
        Path(path).write_bytes(encode_png(width, height, mode, pixels))
    elif fmt == "BMP":
        Path(path).write_bytes(encode_bmp(width, height, mode, pixels))
    else:
        image_mod = _pillow()
        if image_mod is None:
            raise ImageFormatError(f"writing {fmt} needs Pillow; choose PNG or BMP, or install Pillow")
        img = image_mod.frombytes(mode, (width, height), pixels)
        if fmt == "JPEG" and mode not in ("L", "RGB"):
            img = img.convert("RGB")
        img.save(path, format=fmt)
