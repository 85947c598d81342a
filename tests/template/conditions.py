"""template.yaml as CloudFormation creates it for a set of parameters: the conditions evaluated, every
`Fn::If` decided, `AWS::NoValue` dropped, the resources and outputs of false conditions left out."""

from __future__ import annotations

from typing import Any

from tests.template.template_model import NO_VALUE, _template

_DROP = object()


def parameters(**given: str) -> dict[str, Any]:
    values = {name: p.get("Default", "") for name, p in _template()["Parameters"].items()}
    values.update(given)
    return values


def conditions(params: dict[str, Any]) -> dict[str, bool]:
    raw = _template()["Conditions"]
    done: dict[str, bool] = {}

    def value(v: Any) -> Any:
        if isinstance(v, dict) and set(v) == {"Ref"}:
            return params[v["Ref"]]
        return v

    def ev(expr: Any) -> bool:
        (fn, args), = expr.items()
        if fn == "Condition":
            return cond(args)
        if fn == "Fn::Equals":
            return bool(str(value(args[0])) == str(value(args[1])))
        if fn == "Fn::Not":
            return not ev(args[0])
        if fn == "Fn::And":
            return all(ev(a) for a in args)
        if fn == "Fn::Or":
            return any(ev(a) for a in args)
        raise AssertionError(f"unknown condition function {fn}")

    def cond(name: str) -> bool:
        if name not in done:
            done[name] = ev(raw[name])
        return done[name]

    for name in raw:
        cond(name)
    return done


def resolve(value: Any, conds: dict[str, bool]) -> Any:
    """`value` with every `Fn::If` decided and `AWS::NoValue` removed."""
    if isinstance(value, dict):
        if set(value) == {"Fn::If"}:
            name, yes, no = value["Fn::If"]
            return resolve(yes if conds[name] else no, conds)
        if value == NO_VALUE:
            return _DROP
        out = {k: resolve(v, conds) for k, v in value.items()}
        return {k: v for k, v in out.items() if v is not _DROP}
    if isinstance(value, list):
        items = [resolve(v, conds) for v in value]
        return [v for v in items if v is not _DROP]
    return value


def stack(**given: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(resources, outputs) CloudFormation creates for these parameters."""
    conds = conditions(parameters(**given))
    resources = {name: resolve(r, conds) for name, r in _template()["Resources"].items()
                 if "Condition" not in r or conds[r["Condition"]]}
    outputs = {name: resolve(o, conds) for name, o in _template()["Outputs"].items()
               if "Condition" not in o or conds[o["Condition"]]}
    return resources, outputs
