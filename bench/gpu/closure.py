"""The packages the GPU machine lacks: the package's runtime dependency closure (pyproject's
dependencies plus sacremoses, for the paper protocol) minus the machine's image
(bench/gpu/image_packages.txt), each pinned to the version installed here. Printed one
`name==version` a line, for bench/gpu/kit.sh.

    python3 bench/gpu/closure.py
    python3 bench/gpu/closure.py --not-in-image   # installed here but not in the image

Run it where the package is installed with its paper extra (`pip install -e '.[paper]'`):
the closure is read from the installed metadata, with markers evaluated for the machine's
Python 3.12 on x86-64 Linux. Packages of the image are not followed: the image brings their
own dependencies.
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import PackageNotFoundError, distribution, distributions
from pathlib import Path

from packaging.requirements import Requirement

ROOTS = ["transformer", "sacremoses"]
TARGET = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
          "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
          "implementation_name": "cpython", "platform_python_implementation": "CPython",
          "extra": ""}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_packages() -> set[str]:
    text = (Path(__file__).with_name("image_packages.txt")).read_text()
    return {canonical(word) for line in text.splitlines() if not line.startswith("#")
            for word in line.split()}


def missing() -> dict[str, str]:
    """{name: installed version} of the closure's packages that the image lacks."""
    image, found, todo = image_packages(), {}, list(ROOTS)
    while todo:
        name = canonical(todo.pop())
        if name in found or (name in image and name not in ROOTS):
            continue
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            sys.exit(f"error: {name} is not installed here, so its dependencies are unknown: "
                     "install the package with its paper extra (pip install -e '.[paper]')")
        found[name] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate(TARGET):
                todo.append(req.name)
    del found["transformer"]  # the checkout itself travels (PYTHONPATH=src)
    return found


if __name__ == "__main__":
    if sys.argv[1:] == ["--not-in-image"]:  # for bench/gpu/rehearse.sh
        print(*sorted({canonical(d.metadata["Name"]) for d in distributions()}
                      - image_packages()))
    else:
        for name, version in sorted(missing().items()):
            print(f"{name}=={version}")
