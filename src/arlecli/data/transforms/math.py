"""Transforms for math datasets."""

from __future__ import annotations

from arlecli.data.transforms import Row, transform


@transform("gsm8k_answer_number")
def gsm8k_answer_number(row: Row) -> Row:
    """gsm8k: the gold number is the text after the last '####' (kept alongside the rationale)."""
    return {**row, "answer_number": str(row["answer"]).split("####")[-1].strip()}


@transform("asdiv")
def asdiv(row: Row) -> Row:
    """ASDiv: `problem` is body and question joined (as lm-eval's asdiv_cot_llama), and
    `answer_number` the answer without its unit ("9 (apples)" -> "9", lm-eval's split)."""
    problem = f"{str(row.get('body') or '').strip()} {str(row['question']).strip()}".strip()
    return {**row, "problem": problem, "answer_number": str(row["answer"]).split(" (")[0].strip()}


# OlympiadBench's own prompt (also lighteval's olympiad_bench), English open-ended subsets.
_ANSWER_TYPES = {
    "Numerical": "a numerical value",
    "Expression": "an expression",
    "Equation": "an equation",
    "Interval": "an interval",
}


def _answer_type_text(answer_type: str, multiple: bool) -> str:
    # "Tuple" means different things in different problems and "Need_human_evaluate" has no
    # type, so the official prompt says nothing about those.
    if not answer_type or "Need_human_evaluate" in answer_type or "Tuple" in answer_type:
        return ""
    kinds = [next((text for key, text in _ANSWER_TYPES.items() if key in part), "") for part in answer_type.split(",")]
    if not all(kinds):
        return ""
    if not multiple:
        return f"The answer of The problem should be {kinds[0]}. "
    if len(set(kinds)) == 1:
        return f"The problem has multiple answers, each of them should be {kinds[0]}. "
    return f"The problem has multiple answers, with the answers in order being {', '.join(kinds)}. "


@transform("olympiadbench")
def olympiadbench(row: Row) -> Row:
    """OlympiadBench (English open-ended): `instruction` is the official prompt for the row's
    answer type, multiple answers and unit; `answer` is `final_answer` (a list of LaTeX
    strings, often in `$...$`) comma-joined with the dollars dropped."""
    multiple = bool(row.get("is_multiple_answer"))
    subject = "Math" if "Math" in str(row.get("subject") or "Math") else "Physics"
    boxed = "\\boxed{multiple answers connected with commas}" if multiple else "\\boxed{answer}"
    unit_text = ""
    if row.get("unit"):
        boxed += "(unit)"
        unit_text = ", note that the unit of the answer should not be included in \\boxed{}"
    instruction = (
        f"The following is an open-ended problem from an International {subject} competition. "
        f"{_answer_type_text(str(row.get('answer_type') or ''), multiple)}"
        "Please calculate the answer according to the given requirements and the information provided. "
        "Please use LaTeX format to represent the variables and formulas used in the solution process "
        f'and results. Please end your solution with "So the final answer is {boxed}." and give the '
        f"result explicitly{unit_text}."
    )
    finals = row.get("final_answer") or []
    if isinstance(finals, str):
        finals = [finals]
    answer = ", ".join(str(a).strip().strip("$").strip() for a in finals)
    return {**row, "instruction": instruction, "answer": answer}


@transform("deepscaler")
def deepscaler(row: Row) -> Row | list[Row]:
    """agentica-org/DeepScaleR-Preview-Dataset: 6 of its 40,315 rows have an empty `answer`
    (HF discussion #4) and could only ever score 0, so they are left out (an empty list:
    no task); every other row is kept as it is."""
    answer = row.get("answer")
    return [] if answer is None or not str(answer).strip() else row
