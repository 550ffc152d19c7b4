"""Images: Python environments built once on the host and mounted read-only into sandboxes
(images.py), the packages each holds and its SBOM (image_packages.py), and a build's
progress as a person sees it (progress.py).

May import isolation, common and runtime; never the core or the service.
"""
