"""The basics every layer shares (pure: stdlib only).

* :mod:`.errors`: the driver's error hierarchy;
* :mod:`.ids`: the identifier types (``ClaimUID``, ``DeviceName``, ...) and ``ClaimRef``;
* :mod:`.quantity`: Kubernetes quantities and byte formatting;
* :mod:`.semver`: Kubernetes versions;
* :mod:`.kept_encodings`: items' encodings kept between rewrites of a file;
* :mod:`.names`: the Kubernetes name grammar (DNS labels and subdomains, qualified
  names, label keys and values).

``base/`` imports nothing else of the driver, so ``api/`` (the opaque config API)
and ``core/`` can both stand on it.
"""
