"""An image's packages: what is installed, at which version, from where, recorded when the
image is built; and the CycloneDX SBOM made from that list (`sandbox-kernel image inspect`).

The list is read by the image's own interpreter (``importlib.metadata``, what ``pip list``
reads), so it is exactly what a sandbox on the image imports: each distribution with the
image layer it lives in (the image itself, or the base image it is layered on), where pip
got it (its ``direct_url.json``: a URL, a VCS or a local path; else the package index) and
whether the recipe asked for it or it came as a dependency. Sorted and free of build times,
two builds of one recipe that resolve the same versions give the same list and SBOM.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from datetime import datetime, timezone

INDEX = "package index"
PROPERTY = "sandbox-kernel"  # the namespace of this project's CycloneDX properties
# Run by the image's interpreter: every distribution on its path, with what says where it came from.
INVENTORY = r"""
import importlib.metadata as m, json, os
found = []
for dist in m.distributions():
    name = dist.metadata["Name"]
    if not name:
        continue
    path = str(getattr(dist, "_path", "") or "")
    direct = dist.read_text("direct_url.json")
    found.append({"name": name, "version": dist.version, "dist_path": os.path.dirname(path),
                  "direct_url": json.loads(direct) if direct else None,
                  "installer": (dist.read_text("INSTALLER") or "").strip() or None,
                  "requested": dist.read_text("REQUESTED") is not None})
print(json.dumps(found))
"""


def inventory(python: str, layers: dict[str, str], wrap=lambda argv: argv) -> list[dict]:
    """The packages ``python`` sees; ``layers`` maps each layer's site directory on the host
    to its image name (the first that holds a package names its layer). ``wrap`` runs the
    command where ``python`` lives (inside an image's own root: debian_root.inside)."""
    out = subprocess.run(wrap([python, "-c", INVENTORY]), capture_output=True, text=True, check=True,
                         timeout=300).stdout
    packages = {}
    for dist in json.loads(out):
        key = dist["name"].lower().replace("_", "-")
        if key in packages:  # shadowed by an earlier path entry, as for the interpreter
            continue
        layer = next((name for site, name in layers.items() if dist["dist_path"].startswith(site)), "interpreter")
        direct = dist["direct_url"] or {}
        packages[key] = {"name": dist["name"], "version": dist["version"], "layer": layer,
                         "source": direct.get("url") or INDEX, "requested": dist["requested"],
                         "installer": dist["installer"]}
    return [packages[key] for key in sorted(packages)]


def package_list(image: dict) -> list[dict]:
    """An image's packages; for an image built before sources were recorded, its frozen
    ``name==version`` list with the source unknown."""
    if image.get("package_list") is not None:
        return image["package_list"]
    listed = []
    for line in image.get("packages") or []:
        name, _, version = line.partition("==")
        listed.append({"name": name, "version": version, "layer": None, "source": None, "requested": None,
                       "installer": None})
    return sorted(listed, key=lambda p: p["name"].lower())


def sbom(image: dict) -> str:
    """The image's CycloneDX 1.5 SBOM (JSON), made with the CycloneDX project's own library.
    Its serial number and time come from the image (its recipe hash and build time), so the
    document is the same every time it is asked for."""
    from cyclonedx.model import Property
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.output.json import JsonV1Dot5

    bom = Bom(serial_number=uuid.uuid5(uuid.NAMESPACE_URL, f"sandbox-kernel:image:{image['name']}:{image.get('hash')}"))
    bom.metadata.timestamp = datetime.strptime(image["built_at"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    bom.metadata.component = Component(name=image["name"], version=image.get("hash") or "unknown",
                                       type=ComponentType.CONTAINER, bom_ref=f"image:{image['name']}")
    image_component = bom.metadata.component
    if image.get("base") and image.get("root"):  # layered on another image's root: which one, which build
        image_component.properties.add(Property(name=f"{PROPERTY}:base", value=image["base"]))
        image_component.properties.add(Property(name=f"{PROPERTY}:base-hash", value=image.get("base_hash") or ""))
    for package in package_list(image):
        bom.components.add(_component(package))
    # The image is made of its packages: a complete dependency graph (the library warns of an
    # incomplete one, and a reader of the SBOM cannot tell what the image holds without it).
    bom.register_dependency(image_component, bom.components)
    return JsonV1Dot5(bom).output_as_string(indent=1)



def _component(package: dict):
    """One package as a CycloneDX component: a pypi, deb or npm purl (the purl spec's
    types), its licences by name where the metadata gave them, its source where it is not
    the ecosystem's usual one."""
    from cyclonedx.model import ExternalReference, ExternalReferenceType, Property, XsUri
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.model.license import DisjunctiveLicense
    from packageurl import PackageURL

    ecosystem = package.get("ecosystem") or "pypi"
    refs = []
    if ecosystem == "pypi":
        name = package["name"].lower().replace("_", "-")  # the purl spec's pypi normalisation
        purl = PackageURL(type="pypi", name=name, version=package["version"])
        if package.get("source") and package["source"] != INDEX:
            refs.append(ExternalReference(type=ExternalReferenceType.DISTRIBUTION, url=XsUri(package["source"])))
    elif ecosystem == "deb":
        name = package["name"]
        purl = PackageURL(type="deb", namespace="debian", name=name, version=package["version"],
                          qualifiers={"arch": package.get("arch") or "amd64"})
    else:
        namespace, _, name = package["name"].rpartition("/")
        purl = PackageURL(type="npm", namespace=namespace or None, name=name, version=package["version"])
        name = package["name"]
    # a layered image's package names the image (layer) that brought it: the base's or its own
    properties = [Property(name=f"{PROPERTY}:image", value=package["image"])] if package.get("image") else []
    return Component(name=name, version=package["version"], type=ComponentType.LIBRARY, purl=purl,
                     bom_ref=f"{ecosystem}:{name}@{package['version']}", external_references=refs,
                     licenses=[DisjunctiveLicense(name=lic) for lic in package.get("licenses") or []],
                     properties=properties)
