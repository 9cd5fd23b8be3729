"""The error of SBML import (its own module: raised by the math converter and the importer alike,
importable without libsbml or sympy)."""


class SBMLError(ValueError):
    """An SBML document that diffsoup cannot import: an unsupported feature or an invalid model.
    The message names the SBML element (type and id) and what is unsupported."""
