"""The recall set for ``bench_memory.py``: facts about people, and questions about them.

Twelve kinds of fact per person (45 people: 30 written about in Chinese, 15 in English): 540
memories. Every question has exactly one right memory. Questions come in three forms: the
direct question ("张伟对什么过敏"), a paraphrase sharing few words with the fact ("张伟有什么
不能吃的"), and keywords ("张伟 过敏", two characters after the name). ``CONCEPTS`` is what the
fake embedding model "knows" about paraphrases (a real model learns this; see memory.testing).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["CONCEPTS", "Fact", "Question", "build", "filler"]


@dataclass(frozen=True)
class Kind:
    name: str
    values_zh: tuple[str, ...]
    values_en: tuple[str, ...]
    fact_zh: str
    ask_zh: str
    para_zh: str
    key_zh: str
    fact_en: str
    ask_en: str
    para_en: str
    key_en: str


KINDS = (
    Kind("allergy", ("花生", "海鲜", "芒果", "牛奶", "猫毛", "花粉"), ("peanuts", "seafood", "mango", "milk", "pollen"),
         "{n}对{v}过敏", "{n}对什么过敏", "{n}有什么不能吃的", "{n} 过敏",
         "{n} is allergic to {v}", "what is {n} allergic to", "what must {n} avoid eating", "{n} allergy"),
    Kind("city", ("北京", "上海", "杭州", "成都", "深圳", "武汉"), ("Berlin", "Boston", "Sydney", "Toronto", "Dublin"),
         "{n}住在{v}", "{n}住在哪里", "{n}家在哪个城市", "{n} 住址",
         "{n} lives in {v}", "where does {n} live", "which city is home for {n}", "{n} home"),
    Kind("pet", ("猫", "狗", "兔子", "鹦鹉", "仓鼠"), ("cat", "dog", "rabbit", "parrot", "hamster"),
         "{n}养了一只{v}", "{n}养了什么宠物", "{n}家里有什么小动物", "{n} 宠物",
         "{n} has a pet {v}", "what pet does {n} have", "which animal lives with {n}", "{n} pet"),
    Kind("birthday", ("一月", "三月", "五月", "七月", "九月", "十一月"), ("January", "March", "May", "July", "October"),
         "{n}的生日在{v}", "{n}的生日是几月", "{n}哪个月出生", "{n} 生日",
         "{n}'s birthday is in {v}", "when is {n}'s birthday", "which month was {n} born", "{n} birthday"),
    Kind("job", ("工程师", "医生", "老师", "设计师", "律师"), ("engineer", "doctor", "teacher", "designer", "lawyer"),
         "{n}的工作是{v}", "{n}是做什么工作的", "{n}的职业是什么", "{n} 工作",
         "{n} works as a {v}", "what is {n}'s job", "what does {n} do for a living", "{n} job"),
    Kind("hobby", ("爬山", "游泳", "弹钢琴", "摄影", "下棋"), ("hiking", "swimming", "piano", "photography", "chess"),
         "{n}的爱好是{v}", "{n}的爱好是什么", "{n}周末一般喜欢干嘛", "{n} 爱好",
         "{n}'s hobby is {v}", "what is {n}'s hobby", "how does {n} like to spend weekends", "{n} hobby"),
    Kind("food", ("火锅", "饺子", "寿司", "烤鸭", "拉面"), ("pizza", "sushi", "tacos", "curry", "ramen"),
         "{n}最喜欢吃{v}", "{n}最喜欢吃什么", "请{n}吃饭点什么好", "{n} 爱吃",
         "{n}'s favourite food is {v}", "what is {n}'s favourite food", "what should we order for {n} at dinner",
         "{n} food"),
    Kind("drink", ("美式咖啡", "拿铁", "绿茶", "奶茶", "可乐"), ("espresso", "latte", "green tea", "cola", "orange juice"),
         "{n}只喝{v}", "{n}喝什么饮料", "给{n}带杯什么喝的", "{n} 饮料",
         "{n} only drinks {v}", "what does {n} drink", "what beverage should I bring {n}", "{n} drink"),
    Kind("car", ("特斯拉", "比亚迪", "大众", "丰田", "宝马"), ("Tesla", "Toyota", "Volvo", "Ford", "Honda"),
         "{n}开的车是{v}", "{n}开什么车", "{n}的座驾是什么牌子", "{n} 车",
         "{n} drives a {v}", "what car does {n} drive", "which vehicle brand does {n} own", "{n} car"),
    Kind("meeting", ("周一", "周二", "周三", "周四", "周五"), ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday"),
         "{n}组的周会改到{v}了", "{n}组周会是哪天", "{n}他们组例会在星期几", "{n} 周会",
         "{n}'s team meeting moved to {v}", "which day is {n}'s team meeting", "when does {n}'s team sync up",
         "{n} meeting"),
    Kind("language", ("日语", "法语", "德语", "西班牙语", "韩语"), ("Japanese", "French", "German", "Spanish", "Korean"),
         "{n}在学{v}", "{n}在学什么语言", "{n}最近在练哪门外语", "{n} 外语",
         "{n} is learning {v}", "what language is {n} learning", "which foreign tongue does {n} study", "{n} language"),
    Kind("sport", ("羽毛球", "篮球", "乒乓球", "足球", "网球"), ("tennis", "soccer", "basketball", "golf", "cricket"),
         "{n}每周打{v}", "{n}打什么球", "{n}平时做什么运动", "{n} 运动",
         "{n} plays {v} every week", "what sport does {n} play", "how does {n} exercise", "{n} sport"),
)

NAMES_ZH = ("张伟", "王芳", "李娜", "刘洋", "陈静", "杨帆", "赵磊", "黄敏", "周杰", "吴昊", "徐丽", "孙强", "胡军",
            "朱琳", "高峰", "林涛", "何雪", "郭鹏", "马超", "罗婷", "梁宇", "宋佳", "郑浩", "谢楠", "韩梅", "唐亮",
            "冯静怡", "于洋", "董欣", "萧然")
NAMES_EN = ("Alice", "Bob", "Carol", "David", "Emma", "Frank", "Grace", "Henry", "Irene", "Jack", "Karen", "Leo",
            "Mia", "Noah", "Olivia")

CONCEPTS = {
    "过敏": "ALLERGY", "不能吃": "ALLERGY", "allergic": "ALLERGY", "avoid": "ALLERGY", "allergy": "ALLERGY",
    "住在": "HOME", "住址": "HOME", "城市": "HOME", "家在": "HOME", "lives": "HOME", "live": "HOME", "home": "HOME",
    "city": "HOME",
    "宠物": "PET", "小动物": "PET", "养了": "PET", "pet": "PET", "animal": "PET",
    "生日": "BIRTH", "出生": "BIRTH", "birthday": "BIRTH", "born": "BIRTH",
    "工作": "JOB", "职业": "JOB", "job": "JOB", "works": "JOB", "living": "JOB",
    "爱好": "HOBBY", "周末": "HOBBY", "hobby": "HOBBY", "weekends": "HOBBY",
    "喜欢吃": "FOOD", "吃饭": "FOOD", "点什么": "FOOD", "爱吃": "FOOD", "food": "FOOD", "dinner": "FOOD",
    "order": "FOOD",
    "喝": "DRINK", "饮料": "DRINK", "drinks": "DRINK", "drink": "DRINK", "beverage": "DRINK",
    "车": "CAR", "座驾": "CAR", "car": "CAR", "drives": "CAR", "drive": "CAR", "vehicle": "CAR",
    "周会": "MEETING", "例会": "MEETING", "meeting": "MEETING", "sync": "MEETING",
    "语言": "LANG", "外语": "LANG", "学": "LANG", "language": "LANG", "learning": "LANG", "tongue": "LANG",
    "study": "LANG",
    "打": "SPORT", "球": "SPORT", "运动": "SPORT", "sport": "SPORT", "plays": "SPORT", "play": "SPORT",
    "exercise": "SPORT",
}


@dataclass(frozen=True)
class Fact:
    key: tuple[str, str]
    text: str


@dataclass(frozen=True)
class Question:
    key: tuple[str, str]
    text: str
    form: str  # "ask", "paraphrase" or "keywords"
    lang: str


def build(seed: int = 14, questions: int = 240) -> tuple[list[Fact], list[Question]]:
    rng = random.Random(seed)
    facts: list[Fact] = []
    asks: list[Question] = []
    for lang, names in (("zh", NAMES_ZH), ("en", NAMES_EN)):
        for n in names:
            for kind in KINDS:
                values = kind.values_zh if lang == "zh" else kind.values_en
                template = kind.fact_zh if lang == "zh" else kind.fact_en
                facts.append(Fact((n, kind.name), template.format(n=n, v=rng.choice(values))))
                forms = ((kind.ask_zh, kind.para_zh, kind.key_zh) if lang == "zh"
                         else (kind.ask_en, kind.para_en, kind.key_en))
                for form, text in zip(("ask", "paraphrase", "keywords"), forms, strict=True):
                    asks.append(Question((n, kind.name), text.format(n=n), form, lang))
    rng.shuffle(asks)
    return facts, asks[:questions]


_SYL = "安白陈邓丁方冯高郭韩何胡江金孔李林刘陆罗马孟倪潘钱秦任沈石宋苏孙汤田王魏吴夏谢徐许严杨叶于袁张赵郑周朱"


def filler(count: int, seed: int = 7) -> list[str]:
    """Other people's facts of the same kinds, to grow the store to 10k and 100k memories."""
    rng = random.Random(seed)
    out: list[str] = []
    for i in range(count):
        kind = KINDS[i % len(KINDS)]
        if i % 3:
            name = rng.choice(_SYL) + rng.choice(_SYL) + rng.choice(_SYL)
            out.append(kind.fact_zh.format(n=name, v=rng.choice(kind.values_zh)))
        else:
            name = f"User{rng.randrange(1_000_000)}"
            out.append(kind.fact_en.format(n=name, v=rng.choice(kind.values_en)))
    return out
