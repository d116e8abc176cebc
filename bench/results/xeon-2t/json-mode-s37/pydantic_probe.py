#!/usr/bin/env python3
"""Which schemas of common pydantic v2 models a running `cachetune serve` takes (thirty-seventh
session): each model's `model_json_schema()` is sent as response_format json_schema with
max_tokens 1, and the server's 200 or 400 (with its message) printed.

    build/cachetune serve --model smollm2-135m --port 8080 &
    python3 bench/results/xeon-2t/json-mode-s37/pydantic_probe.py --base-url http://127.0.0.1:8080
"""
import argparse
import datetime
import enum
import json
import typing
import urllib.error
import urllib.request
import uuid

from pydantic import BaseModel, Field


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Addr(BaseModel):
    street: str
    city: str


class Cat(BaseModel):
    kind: typing.Literal["cat"]
    meows: int


class Dog(BaseModel):
    kind: typing.Literal["dog"]
    barks: float


class OptionalModel(BaseModel):
    a: typing.Optional[Addr] = None


class ModelFieldWithDescription(BaseModel):
    a: Addr = Field(description="home")


class DiscriminatedUnion(BaseModel):
    pet: typing.Union[Cat, Dog] = Field(discriminator="kind")


class PlainUnionOfModels(BaseModel):
    pet: typing.Union[Cat, Dog]


class EnumDefault(BaseModel):
    c: Color = Color.RED


class ListDict(BaseModel):
    tags: typing.List[str] = Field(default_factory=list, max_length=3)
    d: typing.Dict[str, int]


class UnionScalars(BaseModel):
    x: typing.Union[int, str]
    y: typing.Optional[float] = None


class Formats(BaseModel):
    t: datetime.datetime
    u: uuid.UUID
    dt: datetime.date
    tm: datetime.time


class MultipleOf(BaseModel):
    n: int = Field(multiple_of=5, ge=0)


class SetUniqueItems(BaseModel):
    s: typing.Set[int]


class TuplePrefixItems(BaseModel):
    t: typing.Tuple[int, str]


class Timedelta(BaseModel):
    d: datetime.timedelta


class PatternWithLength(BaseModel):
    x: typing.Annotated[str, Field(min_length=2, pattern=r"^[a-z]+$")]


class Recursive(BaseModel):
    v: int
    children: typing.List["Recursive"] = []


class Bytes(BaseModel):
    b: bytes


class DictMaxProperties(BaseModel):
    d: typing.Dict[str, Addr] = Field(max_length=2)


class Misc(BaseModel):
    f: float = Field(gt=0, lt=1, description="prob")
    a: typing.Optional[typing.List[Addr]] = None


class LiteralMixed(BaseModel):
    l: typing.Literal[1, "a", None]


MODELS = [OptionalModel, ModelFieldWithDescription, DiscriminatedUnion, PlainUnionOfModels,
          EnumDefault, ListDict, UnionScalars, Formats, MultipleOf, SetUniqueItems,
          TuplePrefixItems, Timedelta, PatternWithLength, Recursive, Bytes, DictMaxProperties,
          Misc, LiteralMixed]

ap = argparse.ArgumentParser()
ap.add_argument("--base-url", default="http://127.0.0.1:8080")
args = ap.parse_args()
taken = 0
for m in MODELS:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "x", "schema": m.model_json_schema()}}}
    req = urllib.request.Request(args.base_url + "/v1/chat/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req).read()
        taken += 1
        print(f"taken    {m.__name__}")
    except urllib.error.HTTPError as e:
        print(f"refused  {m.__name__}: {json.loads(e.read())['error']['message'][:160]}")
print(f"{taken} of {len(MODELS)} taken")
